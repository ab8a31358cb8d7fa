"""The works the toolkit cites, keyed once: methods (:attr:`attributions.methods.Method.cite`),
checks (:attr:`audit.checks.base.Check.cite`), the report's methods text and ``references.bib``
use the same keys."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reference:
    """One BibTeX entry: ``kind`` (article, inproceedings, ...) and its fields; ``authors`` in
    "Last, First" form."""

    kind: str
    authors: tuple[str, ...]
    title: str
    year: int
    fields: tuple[tuple[str, str], ...] = ()

    def short(self) -> str:
        """Author-year text: "Sixt et al., 2020", "Zeiler and Fergus, 2014"."""
        last = [a.split(",")[0] for a in self.authors if a != "others"]
        names = last[0] if len(last) == 1 and "others" not in self.authors else \
            f"{last[0]} and {last[1]}" if len(last) == 2 and "others" not in self.authors else f"{last[0]} et al."
        return f"{names}, {self.year}"


def _ref(kind: str, authors: str, title: str, year: int, **fields: str) -> Reference:
    return Reference(kind, tuple(a.strip() for a in authors.split(";")), title, year, tuple(fields.items()))


# the edited volume both Montavon et al. 2019 and Kindermans et al. 2019 appeared in
_XAI_BOOK = dict(booktitle="Explainable AI: Interpreting, Explaining and Visualizing Deep Learning",
                 series="Lecture Notes in Computer Science", volume="11700", publisher="Springer")

REFERENCES: dict[str, Reference] = {
    "sixt2020": _ref("inproceedings", "Sixt, Leon; Granz, Maximilian; Landgraf, Tim",
                     "When Explanations Lie: Why Many Modified {BP} Attributions Fail", 2020,
                     booktitle="Proceedings of the 37th International Conference on Machine Learning (ICML)",
                     series="PMLR", volume="119", pages="9046--9057"),
    "adebayo2018": _ref("inproceedings", "Adebayo, Julius; Gilmer, Justin; Muelly, Michael; Goodfellow, Ian; "
                        "Hardt, Moritz; Kim, Been", "Sanity Checks for Saliency Maps", 2018,
                        booktitle="Advances in Neural Information Processing Systems 31 (NeurIPS)",
                        pages="9505--9515"),
    "adebayo2020": _ref("inproceedings", "Adebayo, Julius; Muelly, Michael; Liccardi, Ilaria; Kim, Been",
                        "Debugging Tests for Model Explanations", 2020,
                        booktitle="Advances in Neural Information Processing Systems 33 (NeurIPS)"),
    "adebayo2022": _ref("inproceedings", "Adebayo, Julius; Muelly, Michael; Abelson, Harold; Kim, Been",
                        "Post hoc Explanations may be Ineffective for Detecting Unknown Spurious Correlation", 2022,
                        booktitle="International Conference on Learning Representations (ICLR)"),
    "yang2019": _ref("misc", "Yang, Mengjiao; Kim, Been",
                     "Benchmarking Attribution Methods with Relative Feature Importance", 2019,
                     howpublished="arXiv:1907.09701"),
    "gu2017": _ref("misc", "Gu, Tianyu; Dolan-Gavitt, Brendan; Garg, Siddharth",
                   "{BadNets}: Identifying Vulnerabilities in the Machine Learning Model Supply Chain", 2017,
                   howpublished="arXiv:1708.06733"),
    "zhou2022": _ref("inproceedings", "Zhou, Yilun; Booth, Serena; Ribeiro, Marco Tulio; Shah, Julie",
                     "Do Feature Attribution Methods Correctly Attribute Features?", 2022,
                     booktitle="Proceedings of the AAAI Conference on Artificial Intelligence"),
    "zhang2023bort": _ref("inproceedings", "Zhang, Borui; Zheng, Wenzhao; Zhou, Jie; Lu, Jiwen",
                          "Bort: Towards Explainable Neural Networks with Bounded Orthogonal Constraint", 2023,
                          booktitle="International Conference on Learning Representations (ICLR)"),
    "bach2015": _ref("article", "Bach, Sebastian; Binder, Alexander; Montavon, Gr{\\'e}goire; Klauschen, Frederick; "
                     "M{\\\"u}ller, Klaus-Robert; Samek, Wojciech", "On Pixel-Wise Explanations for Non-Linear "
                     "Classifier Decisions by Layer-Wise Relevance Propagation", 2015, journal="PLoS ONE",
                     volume="10", number="7", pages="e0130140"),
    "montavon2017": _ref("article", "Montavon, Gr{\\'e}goire; Lapuschkin, Sebastian; Binder, Alexander; Samek, "
                         "Wojciech; M{\\\"u}ller, Klaus-Robert", "Explaining Nonlinear Classification Decisions with "
                         "Deep {T}aylor Decomposition", 2017, journal="Pattern Recognition", volume="65",
                         pages="211--222"),
    "montavon2019": _ref("incollection", "Montavon, Gr{\\'e}goire; Binder, Alexander; Lapuschkin, Sebastian; "
                         "Samek, Wojciech; M{\\\"u}ller, Klaus-Robert", "Layer-Wise Relevance Propagation: An "
                         "Overview", 2019, **_XAI_BOOK, pages="193--209"),
    "kohlbrenner2020": _ref("inproceedings", "Kohlbrenner, Maximilian; Bauer, Alexander; Nakajima, Shinichi; "
                            "Binder, Alexander; Samek, Wojciech; Lapuschkin, Sebastian", "Towards Best Practice in "
                            "Explaining Neural Network Decisions with {LRP}", 2020,
                            booktitle="International Joint Conference on Neural Networks (IJCNN)", pages="1--7"),
    "shrikumar2016": _ref("misc", "Shrikumar, Avanti; Greenside, Peyton; Shcherbina, Anna; Kundaje, Anshul",
                          "Not Just a Black Box: Learning Important Features Through Propagating Activation "
                          "Differences", 2016, howpublished="arXiv:1605.01713"),
    "shrikumar2017": _ref("inproceedings", "Shrikumar, Avanti; Greenside, Peyton; Kundaje, Anshul",
                          "Learning Important Features Through Propagating Activation Differences", 2017,
                          booktitle="Proceedings of the 34th International Conference on Machine Learning (ICML)",
                          series="PMLR", volume="70", pages="3145--3153"),
    "springenberg2015": _ref("inproceedings", "Springenberg, Jost Tobias; Dosovitskiy, Alexey; Brox, Thomas; "
                             "Riedmiller, Martin", "Striving for Simplicity: The All Convolutional Net", 2015,
                             booktitle="International Conference on Learning Representations (ICLR), workshop track"),
    "simonyan2014": _ref("inproceedings", "Simonyan, Karen; Vedaldi, Andrea; Zisserman, Andrew",
                         "Deep Inside Convolutional Networks: Visualising Image Classification Models and Saliency "
                         "Maps", 2014, booktitle="International Conference on Learning Representations (ICLR), "
                         "workshop track"),
    "zeiler2014": _ref("inproceedings", "Zeiler, Matthew D.; Fergus, Rob", "Visualizing and Understanding "
                       "Convolutional Networks", 2014, booktitle="European Conference on Computer Vision (ECCV)",
                       series="Lecture Notes in Computer Science", volume="8689", pages="818--833"),
    "sundararajan2017": _ref("inproceedings", "Sundararajan, Mukund; Taly, Ankur; Yan, Qiqi",
                             "Axiomatic Attribution for Deep Networks", 2017,
                             booktitle="Proceedings of the 34th International Conference on Machine Learning (ICML)",
                             series="PMLR", volume="70", pages="3319--3328"),
    "smilkov2017": _ref("misc", "Smilkov, Daniel; Thorat, Nikhil; Kim, Been; Vi{\\'e}gas, Fernanda; Wattenberg, "
                        "Martin", "{SmoothGrad}: Removing Noise by Adding Noise", 2017,
                        howpublished="arXiv:1706.03825"),
    "kim2019": _ref("misc", "Kim, Beomsu; Seo, Junghoon; Jeon, Seunghyeon; Koo, Jamyoung; Choe, Jeesoo; Jeon, Taegyun",
                    "Why are Saliency Maps Noisy? Cause of and Solution to Noisy Saliency Maps", 2019,
                    howpublished="arXiv:1902.04893; IEEE/CVF ICCV Workshops 2019"),
    "selvaraju2017": _ref("inproceedings", "Selvaraju, Ramprasaath R.; Cogswell, Michael; Das, Abhishek; Vedantam, "
                          "Ramakrishna; Parikh, Devi; Batra, Dhruv", "{Grad-CAM}: Visual Explanations from Deep "
                          "Networks via Gradient-Based Localization", 2017,
                          booktitle="IEEE International Conference on Computer Vision (ICCV)", pages="618--626"),
    "alber2019": _ref("article", "Alber, Maximilian; Lapuschkin, Sebastian; Seegerer, Philipp; H{\\\"a}gele, Miriam; "
                      "Sch{\\\"u}tt, Kristof T.; Montavon, Gr{\\'e}goire; Samek, Wojciech; M{\\\"u}ller, Klaus-Robert; "
                      "D{\\\"a}hne, Sven; Kindermans, Pieter-Jan", "{iNNvestigate} Neural Networks!", 2019,
                      journal="Journal of Machine Learning Research", volume="20", number="93", pages="1--8"),
    "gildenblat2021": _ref("misc", "Gildenblat, Jacob; others", "{PyTorch} Library for {CAM} Methods", 2021,
                           howpublished="GitHub repository jacobgil/pytorch-grad-cam; PyPI package grad-cam"),
    "abnar2020": _ref("inproceedings", "Abnar, Samira; Zuidema, Willem", "Quantifying Attention Flow in Transformers",
                      2020, booktitle="Proceedings of the 58th Annual Meeting of the Association for Computational "
                      "Linguistics (ACL)", pages="4190--4197"),
    "chefer2021": _ref("inproceedings", "Chefer, Hila; Gur, Shir; Wolf, Lior", "Transformer Interpretability Beyond "
                       "Attention Visualization", 2021, booktitle="IEEE/CVF Conference on Computer Vision and Pattern "
                       "Recognition (CVPR)", pages="782--791"),
    "chefer2021generic": _ref("inproceedings", "Chefer, Hila; Gur, Shir; Wolf, Lior", "Generic Attention-model "
                              "Explainability for Interpreting Bi-Modal and Encoder-Decoder Transformers", 2021,
                              booktitle="IEEE/CVF International Conference on Computer Vision (ICCV)",
                              pages="397--406"),
    "kindermans2018": _ref("inproceedings", "Kindermans, Pieter-Jan; Sch{\\\"u}tt, Kristof T.; Alber, Maximilian; "
                           "M{\\\"u}ller, Klaus-Robert; Erhan, Dumitru; Kim, Been; D{\\\"a}hne, Sven",
                           "Learning How to Explain Neural Networks: {PatternNet} and {PatternAttribution}", 2018,
                           booktitle="International Conference on Learning Representations (ICLR)"),
    "zhang2016": _ref("inproceedings", "Zhang, Jianming; Lin, Zhe; Brandt, Jonathan; Shen, Xiaohui; Sclaroff, Stan",
                      "Top-Down Neural Attention by Excitation Backprop", 2016,
                      booktitle="European Conference on Computer Vision (ECCV)",
                      series="Lecture Notes in Computer Science", volume="9908", pages="543--559"),
    "kindermans2019": _ref("incollection", "Kindermans, Pieter-Jan; Hooker, Sara; Adebayo, Julius; Alber, "
                           "Maximilian; Sch{\\\"u}tt, Kristof T.; D{\\\"a}hne, Sven; Erhan, Dumitru; Kim, Been",
                           "The (Un)reliability of Saliency Methods", 2019, **_XAI_BOOK, pages="267--280"),
    "hedstrom2023quantus": _ref("article", "Hedstr{\\\"o}m, Anna; Weber, Leander; Krakowczyk, Daniel; Bareeva, "
                                "Dilyara; Motzkus, Franz; Samek, Wojciech; Lapuschkin, Sebastian; H{\\\"o}hne, "
                                "Marina M.-C.", "Quantus: An Explainable {AI} Toolkit for Responsible Evaluation of "
                                "Neural Network Explanations and Beyond", 2023,
                                journal="Journal of Machine Learning Research", volume="24", number="34",
                                pages="1--11"),
    "hedstrom2024": _ref("inproceedings", "Hedstr{\\\"o}m, Anna; Weber, Leander; Lapuschkin, Sebastian; H{\\\"o}hne, "
                         "Marina M.-C.", "A Fresh Look at Sanity Checks for Saliency Maps", 2024,
                         booktitle="Explainable Artificial Intelligence (xAI 2024)",
                         series="Communications in Computer and Information Science", publisher="Springer",
                         note="First presented as ``Sanity Checks Revisited: An Exploration to Repair the Model "
                              "Parameter Randomisation Test'', XAI in Action workshop, NeurIPS 2023"),
    "binder2023": _ref("inproceedings", "Binder, Alexander; Weber, Leander; Lapuschkin, Sebastian; Montavon, "
                       "Gr{\\'e}goire; M{\\\"u}ller, Klaus-Robert; Samek, Wojciech", "Shortcomings of Top-Down "
                       "Randomization-Based Sanity Checks for Evaluations of Deep Neural Network Explanations", 2023,
                       booktitle="IEEE/CVF Conference on Computer Vision and Pattern Recognition (CVPR)",
                       pages="16143--16152"),
    "ali2022": _ref("inproceedings", "Ali, Ameen; Schnake, Thomas; Eberle, Oliver; Montavon, Gr{\\'e}goire; "
                    "M{\\\"u}ller, Klaus-Robert; Wolf, Lior", "{XAI} for Transformers: Better Explanations through "
                    "Conservative Propagation", 2022,
                    booktitle="Proceedings of the 39th International Conference on Machine Learning (ICML)",
                    series="PMLR", volume="162", pages="435--451"),
    "achtibat2024": _ref("inproceedings", "Achtibat, Reduan; Vakilzadeh Hatefi, Sayed Mohammad; Dreyer, Maximilian; "
                         "Jain, Aakriti; Wiegand, Thomas; Lapuschkin, Sebastian; Samek, Wojciech",
                         "{AttnLRP}: Attention-Aware Layer-Wise Relevance Propagation for Transformers", 2024,
                         booktitle="Proceedings of the 41st International Conference on Machine Learning (ICML)",
                         series="PMLR", volume="235"),
    "wang2004": _ref("article", "Wang, Zhou; Bovik, Alan C.; Sheikh, Hamid R.; Simoncelli, Eero P.",
                     "Image Quality Assessment: From Error Visibility to Structural Similarity", 2004,
                     journal="IEEE Transactions on Image Processing", volume="13", number="4", pages="600--612"),
    "efron1993": _ref("book", "Efron, Bradley; Tibshirani, Robert J.", "An Introduction to the Bootstrap", 1993,
                      publisher="Chapman and Hall/CRC"),
    "wilcoxon1945": _ref("article", "Wilcoxon, Frank", "Individual Comparisons by Ranking Methods", 1945,
                         journal="Biometrics Bulletin", volume="1", number="6", pages="80--83"),
    "kokhlikyan2020": _ref("misc", "Kokhlikyan, Narine; Miglani, Vivek; Martin, Miguel; Wang, Edward; Alsallakh, "
                           "Bilal; Reynolds, Jonathan; Melnikov, Alexander; Kliushkina, Natalia; Araya, Carlos; "
                           "Yan, Siqi; Reblitz-Richardson, Orion", "Captum: A Unified and Generic Model "
                           "Interpretability Library for {PyTorch}", 2020, howpublished="arXiv:2009.07896"),
    "vanderwalt2014": _ref("article", "van der Walt, St{\\'e}fan; Sch{\\\"o}nberger, Johannes L.; Nunez-Iglesias, "
                           "Juan; Boulogne, Fran{\\c{c}}ois; Warner, Joshua D.; Yager, Neil; Gouillart, Emmanuelle; "
                           "Yu, Tony", "scikit-image: Image Processing in {P}ython", 2014, journal="PeerJ",
                           volume="2", pages="e453"),
    "paszke2019": _ref("inproceedings", "Paszke, Adam; Gross, Sam; Massa, Francisco; Lerer, Adam; Bradbury, James; "
                       "Chanan, Gregory; others", "{PyTorch}: An Imperative Style, High-Performance Deep Learning "
                       "Library", 2019, booktitle="Advances in Neural Information Processing Systems 32 (NeurIPS)",
                       pages="8024--8035"),
    "xiao2017": _ref("misc", "Xiao, Han; Rasul, Kashif; Vollgraf, Roland", "Fashion-{MNIST}: A Novel Image Dataset "
                     "for Benchmarking Machine Learning Algorithms", 2017, howpublished="arXiv:1708.07747"),
    "okabe2008": _ref("misc", "Okabe, Masataka; Ito, Kei", "Color Universal Design ({CUD}): How to Make Figures and "
                      "Presentations That Are Friendly to Colorblind People", 2008,
                      howpublished="J*Fly, https://jfly.uni-koeln.de/color/"),
}


def short(key: str) -> str:
    """Author-year text of ``key`` without TeX markup, for Markdown and HTML."""
    return plain(REFERENCES[key].short())


def plain(text: str) -> str:
    """``text`` with the TeX accents and braces of this file turned into Unicode."""
    accents = {"{\\'e}": "\u00e9", '{\\"u}': "\u00fc", '{\\"o}': "\u00f6", '{\\"a}': "\u00e4",
               "{\\c{c}}": "\u00e7"}
    for tex, char in accents.items():
        text = text.replace(tex, char)
    return text.replace("{", "").replace("}", "")


def bibtex(keys: list[str] | None = None) -> str:
    """``references.bib``: the entries of ``keys`` (default: every work), in the order given."""
    entries = []
    for key in keys if keys is not None else list(REFERENCES):
        ref = REFERENCES[key]
        lines = [f"@{ref.kind}{{{key},", f"  author = {{{' and '.join(ref.authors)}}},",
                 f"  title = {{{ref.title}}},", f"  year = {{{ref.year}}},"]
        lines += [f"  {name} = {{{value}}}," for name, value in ref.fields]
        entries.append("\n".join(lines) + "\n}\n")
    return "\n".join(entries)
